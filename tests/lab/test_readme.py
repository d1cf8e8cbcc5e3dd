"""The README's generated blocks: written between their markers, and nowhere else."""

from __future__ import annotations

import pytest

from ratelimit.lab import readme


def test_blocks_are_replaced_between_their_markers_only():
    text = "a\n" + readme.begin("x") + "\nold\n" + readme.end("x") + "\nb\n"
    new = readme.rewrite_readme(text, {"x": "new"})
    assert new == "a\n" + readme.begin("x") + "\nnew\n" + readme.end("x") + "\nb\n"
    assert readme.between(new, readme.begin("x"), readme.end("x")) == "new\n"
    with pytest.raises(ValueError, match="no block"):
        readme.rewrite_readme("no markers", {"x": "new"})
