# Site sweeps (EP, PL, ADF) over the dense posterior.  (Implementation lands with issue 3.)
