"""One module per chapter of the book: its computations and its figures.

A chapter (`notebooks/NN_<name>.ipynb`) calls `ratelimit.lab.chapters.<name>`, and so
does its Explore section's sliders: one source of truth per chapter.
"""
