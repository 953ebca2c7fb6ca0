"""The entry layouts against hand derivations, and the impl against every LAYOUT rule."""
from fractions import Fraction

import numpy as np
import pytest
import torch

from dsv4spec.impl import layout as impl
from dsv4spec.spec import layout as spec


@pytest.mark.parametrize("kind,nbytes,bits", [
    ("v4_main_kv", 584, Fraction(73, 8)),   # 448·8/8 + 448/64 scales = 7 -> 8 aligned + 64·16/8 = 448+8+128
    ("fp4_index_k", 68, Fraction(17, 4)),   # 128·4/8 = 64 + 128/32 = 4 -> 68 B = 4.25 bits/dim
    ("v41_main_kv", 288, Fraction(9, 2)),   # 512·4/8 = 256 + 512/16 = 32 -> 288 B = 4.5 bits/dim
    ("v41_swa_kv", 528, Fraction(33, 4)),   # 512 + 512/32 = 16 -> 528
    ("v32_index_k", 132, Fraction(33, 4)),  # 128 + one 4-byte fp32 scale -> 132
    ("v32_mla_kv", 656, Fraction(82, 9)),   # 512 + 4 fp32 scales (16) + 64·2 = 656 B over 576 dims
])
def test_entry_sizes(kind, nbytes, bits):
    assert spec.LAYOUTS[kind].nbytes == nbytes
    assert spec.LAYOUTS[kind].bits_per_value == bits


def test_v41_rope_bf16_variant_is_384_bytes():
    # 448 FP4 = 224 B, 28 E4M3 scales padded to 32, 64 BF16 = 128 B
    assert spec.layout("v41_main_kv", "bf16").nbytes == 384


@pytest.mark.parametrize("kind", spec.KINDS)
@pytest.mark.parametrize("order", sorted(spec.FIELD_ORDERS))
def test_split_then_join_is_the_identity_on_bytes(kind, order):
    data = np.random.default_rng(1).integers(0, 256, (4, spec.LAYOUTS[kind].nbytes), dtype=np.uint8)
    v = {"entry_field_order": order}
    assert np.array_equal(spec.join(kind, spec.split(kind, data, v), v), data)


def test_v4_main_canonical_bytes_by_hand():
    x = np.zeros((1, 512), np.float32)
    x[0, 0] = 448.0          # block 0 amax 448: scale 2^ceil(log2(fl(448·fl(1/448)))) = 2^0 -> E8M0 0x7F
    x[0, 448] = 1.0          # BF16 1.0 = 0x3F80, little-endian 80 3F
    data = spec.pack("v4_main_kv", x)[0]
    assert data[0] == 0x7E                      # E4M3 448 = 0 1111 110
    assert data[448] == 0x7F                    # block 0 scale 2^0
    assert (data[449:455] == 127 - 22).all()    # zero blocks: amax floor 1e-4 -> 2^ceil(log2(1e-4/448)) = 2^-22
    assert data[455] == 0                       # the pad byte
    assert list(data[456:458]) == [0x80, 0x3F] and not data[458:].any()


def test_v32_scale_is_a_little_endian_fp32():
    x = np.zeros((1, 128), np.float32)
    x[0, 5] = 1.0            # scale 2^ceil(log2(fl(1/448))) = 2^-8 = fp32 0x3B800000
    data = spec.pack("v32_index_k", x)[0]
    assert list(data[128:]) == [0x00, 0x00, 0x80, 0x3B]
    assert spec.unpack("v32_index_k", data[None])[0, 5] == 1.0


def test_v32_mla_bytes_by_hand():
    """FlashMLA's 656-byte entry (FlashMLA-api L94-98): tile 0's amax 448 gives scale 1; tile 1's
    amax 0.01 is below 448·1e-4, so its scale is the floor's 2^ceil(log2 1e-4) = 2^-13."""
    x = np.zeros((1, 576), np.float32)
    x[0, 0], x[0, 130], x[0, 512] = 448.0, 0.01, 1.0
    data = spec.pack("v32_mla_kv", x)[0]
    assert data[0] == 0x7E                                   # E4M3 448
    assert data[130] == 0x6A                                 # 0.01 / 2^-13 = 81.92 -> E4M3 80 = 0 1101 010
    assert list(data[512:520]) == [0, 0, 0x80, 0x3F, 0, 0, 0, 0x39]   # fp32 1.0, then 2^-13
    assert list(data[520:528]) == [0, 0, 0, 0x39] * 2                  # all-zero tiles: the floor too
    assert list(data[528:530]) == [0x80, 0x3F] and not data[530:].any()
    assert spec.unpack("v32_mla_kv", data[None])[0, 130] == 80 * 2.0 ** -13


def test_v32_mla_scale_floor_variant_floors_amax_instead():
    x = np.zeros((1, 576), np.float32)
    data = spec.pack("v32_mla_kv", x, {"v32_mla_scale_floor": "amax"})[0]
    assert list(data[512:516]) == [0, 0, 0x80, 0x34]         # 2^ceil(log2(1e-4 / 448)) = 2^-22


def test_fp4_entries_put_the_even_element_low():
    x = np.zeros((1, 128), np.float32)
    x[0, :2] = [6.0, 1.0]    # scale 1 (2^ceil(log2(6·fl(1/6))) = 2^0): codes 7 (6.0) low, 2 (1.0) high
    assert spec.pack("fp4_index_k", x)[0, 0] == 0x27


@pytest.mark.parametrize("kind", spec.KINDS)
def test_spec_unpack_rejects_malformed_buffers(kind):
    lay = spec.LAYOUTS[kind]
    with pytest.raises(ValueError, match=f"{lay.nbytes} bytes"):
        spec.unpack(kind, np.zeros((1, lay.nbytes - 1), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        spec.unpack(kind, np.zeros((1, lay.nbytes), np.int8))
    data = spec.pack(kind, np.ones((1, lay.dims), np.float32))
    scales = spec.split(kind, data)["scales"]
    if lay.scale is spec.FP32:
        scales[0, :4] = spec.le_bytes(np.array([np.nan], "<f4"))
    else:
        scales[0, 0] = 0xFF
    with pytest.raises(ValueError, match="NaN"):
        spec.unpack(kind, data)


def test_impl_errors_name_what_was_expected():
    with pytest.raises(ValueError, match="unknown entry kind 'v4_main'"):
        impl.entry_pack("v4_main", torch.zeros(1, 512))
    with pytest.raises(ValueError, match="584 bytes"):
        impl.entry_unpack("v4_main_kv", torch.zeros(1, 583, dtype=torch.uint8))
    with pytest.raises(ValueError, match="512 dims"):
        impl.entry_pack("v41_main_kv", torch.zeros(2, 448))
    with pytest.raises(ValueError, match="not finite|finite|NaN"):
        impl.entry_pack("v41_main_kv", torch.full((1, 512), float("nan")))


def test_flashmla_pages_hold_the_entries_and_leave_the_pad_unwritten():
    """MODEL1 pages: each entry's NoPE+RoPE run, then the 8-byte scale groups whose 8th byte is the
    entry's pad (FlashMLA-quant L56-62), the page padded to 576 B; V3.2 pages: whole entries."""
    from dsv4spec.spec import layout as sl
    rng = np.random.default_rng(3)
    for kind, page_bytes in (("v4_main_kv", 37440), ("v32_mla_kv", 64 * 656)):
        entries = sl.pack(kind, rng.standard_normal((128, sl.layout(kind).dims)).astype(np.float32))
        pages = sl.to_pages(kind, entries, unwritten=0xAB)
        assert pages.shape == (2, page_bytes) and sl.page_bytes(kind) == page_bytes
        assert np.array_equal(sl.from_pages(kind, pages), sl.with_pad(kind, entries, 0xAB))
    pages = sl.to_pages("v4_main_kv", entries_v4 := sl.pack("v4_main_kv", np.ones((64, 512), np.float32)), 0xAB)
    assert np.array_equal(pages[0, :448], entries_v4[0, :448]) and np.array_equal(pages[0, 448:576], entries_v4[0, 456:])
    assert np.array_equal(pages[0, 64 * 576:64 * 576 + 8], [*entries_v4[0, 448:455], 0xAB])
    assert (pages[0, 64 * 584:] == 0xAB).all()
