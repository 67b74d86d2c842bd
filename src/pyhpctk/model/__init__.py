"""pymodel: empirical scaling models (Performance Model Normal Form) for calling contexts.

:mod:`.pmnf` declares terms, hypotheses and models; :mod:`.fit` searches the hypothesis space for
all contexts at once with batched least squares. Nothing here reads files.
"""
