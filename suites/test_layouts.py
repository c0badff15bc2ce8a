"""Backend layouts: the 128x4 scale swizzle against the formula written out, and its round trip."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.backends.layouts import swizzle_scales_128x4, unswizzle_scales_128x4


def test_swizzle_places_each_scale_where_the_formula_says():
    rows, cols = 300, 9  # padded to 384 x 12: 3 row tiles, 3 column tiles
    scales = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    flat = swizzle_scales_128x4(scales)
    assert flat.numel() == 384 * 12
    col_tiles = 3
    for r in range(0, rows, 7):
        for c in range(cols):
            tile = (r // 128) * col_tiles + c // 4
            rr, cc = r % 128, c % 4
            offset = tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc
            assert flat[offset] == scales[r, c], (r, c)


def test_padding_is_zero():
    flat = swizzle_scales_128x4(torch.full((1, 1), 7, dtype=torch.uint8))
    assert flat.tolist().count(7) == 1 and flat.numel() == 512


@given(rows=st.integers(1, 300), cols=st.integers(1, 20), seed=st.integers(0, 1000))
def test_swizzle_round_trip(rows, cols, seed):
    scales = torch.randint(0, 256, (rows, cols), dtype=torch.int32, generator=torch.Generator().manual_seed(seed)).to(torch.uint8)
    assert torch.equal(unswizzle_scales_128x4(swizzle_scales_128x4(scales), rows, cols), scales)


def test_layout_errors():
    with pytest.raises(ValueError, match="2-D"):
        swizzle_scales_128x4(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="needs 512"):
        unswizzle_scales_128x4(torch.zeros(100, dtype=torch.uint8), 1, 1)
