# Likelihood kernels: see _likelihoods.pxd for the contract.  (Implementation lands with issue 2.)
