"""The rows interface of the sparse core: what one step of :mod:`gpc.sparse.core.steps` asks of
the rows it covers, whatever the model's sites.

A rows object covers all n training rows (a batch pass), one minibatch, or the shards' shares of
either, and holds the state whose sites it refines; every method reads the state's factors, q and
site rule from there, so the step loop hands it nothing but the damping, the cavity or the form of
the gradient.  The sums it returns are in the state's form (one (P - I, h) pair for a binary
problem, a list of them for the C classes of a multi-class fit), and only the state reads them.
"""

from abc import ABC, abstractmethod


class Rows(ABC):
    """Rows that one step covers, their sites refined against the state's q.

    Attributes
    ----------
    size : int
        The rows covered (the state's n for a batch pass).
    u_space : bool
        Whether :meth:`evidence_parts` gives the K_uu part of the gradient in u-space (after a
        swap along the rows' directions, gpc.sparse.ep.block_evidence), read by the state's
        ``gradient``.
    undoable : bool
        Whether a committed batch update can be undone by the state's ``snapshot``/``restore``
        alone (the rows keep nothing of the old sites): the step loop then drops a pass whose log
        Z is not a log probability (:func:`gpc.sparse.core.steps.iteration`).
    accelerable : bool
        Whether every row's sites are the state's, read and set whole by its ``site_vector()`` and
        ``set_site_vector(x)`` (rows in this process, not on an engine's shards): batch passes at
        fixed parameters are then Anderson-accelerated (:class:`gpc.sparse.core.steps.SiteAnderson`).
    """

    size: int
    u_space = False
    undoable = False
    accelerable = False

    @abstractmethod
    def update_sites(self, damping):
        """All n rows: every site refined from the same q, damped by ``damping``; returns the new
        sites' sums with the current factors (q is rebuilt from them), the sites pending until
        :meth:`commit`."""

    def swap_sites(self, damping):
        """A minibatch: the rows' sites refined against their cavities and swapped in q along
        their kept directions (SEP eq. (6)); returns (q's new natural parameters, the rows that had
        no site), the sites and directions pending until :meth:`commit`."""
        raise NotImplementedError(f"{type(self).__name__} takes no minibatch steps")

    def match_sites(self, cavity):
        """Tied sites: each row's sites matched against the tied ``cavity``; returns their sums.
        :meth:`evidence_parts` then takes the tied evidence of these rows."""
        raise NotImplementedError(f"{type(self).__name__} takes no tied steps")

    @abstractmethod
    def commit(self):
        """Keep the pending sites (and directions)."""

    @abstractmethod
    def revert(self):
        """Drop the pending sites: the state's stay as they were."""

    @abstractmethod
    def evidence_parts(self, gradient, held):
        """The evidence's data terms over these rows at the state's q and, with ``gradient``, its
        gradient's parts, the sites held as ``held`` says ("sites": each site follows its row, a
        batch pass; "cavity": each cavity held in u-space, SEP eq. (4))."""
