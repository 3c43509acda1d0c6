"""The sparse core: what every inducing-point model here is built on (SEP §2-§3).

A sparse model holds, per latent function, q(u) on m inducing points with sites that are rank one
along the rows' directions; what it adds is its likelihood's site rule and evidence terms.  The
binary model (gpc.sparse: ``_train``, ``_passes``, ``ep``, ``baselines``, ``_distributed``) and the
multi-class one (gpc.multiclass.sparse, ``sparse_vi``, ``_sparse_distributed``) are its tenants:

* :mod:`.inducing`: K_uu's factor and inverse, whitened rows, FITC variances, gradients to θ, Z;
* :mod:`.natural`: q(w) by its natural parameters, its whitened algebra and model-free gradient parts;
* :mod:`.passes`: row blocks of any row-sliceable array, and the evidence's q-only part;
* :mod:`.rows`: :class:`~.rows.Rows`, the one interface of the rows a step covers;
* :mod:`.steps`: the one step loop (``iteration``, ``tied_iteration``, ``run_ep``), its failure
  rule, the state base :class:`~.steps.SparseState` and Adadelta;
* :mod:`.trainers`: the trainers (batch, minibatch, tied, SVI, L-BFGS-B) and ``TrainingRows``;
* :mod:`.variational`: SVI's bound on the core (the chain rule and KL) and the L-BFGS-B states;
* :mod:`.shards`: what both models' distributed fits send and bring home.

A new sparse likelihood is a new tenant: a state (a ``SparseState`` with the hooks its docstring
lists), rows (a ``Rows``) and a ``TrainingRows`` source; it reuses the loop and the trainers.
"""
