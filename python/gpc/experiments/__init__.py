"""Experiments: the command line's main job (``compare``) and the papers' reproductions."""
