"""How ops look in every chart: pipelines, chunks and colours a reader can
tell apart (issue 52: Chimera's two pipelines were called chunks, BitPipe's
four purple shades could not be told apart).

Golden values come from the schedules' papers: Chimera's down pipeline
runs stage i on device i and its up pipeline on device p-1-i, and each
unit of p microbatches sends half down and half up (Li and Hoefler, SC'21;
restated in docs/research/bidirectional.md); BitPipe makes each of its two
pipelines a V over two stages per device, so a device holds a stage s < p
and a stage s >= p of each (Wu, Chen, Yu, arXiv 2410.19367); interleaved
1F1B puts stage s on device s mod p (Narayanan et al., SC'21). The colour
distance is CIE76 Delta E, computed here from the sRGB and CIELAB
definitions.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pipecore as pc
from pipecore.output.colours import chunk_of, op_styles, pipelines_of, shade_hex


def _styles(name, p=8, m=32, chunks=1):
    t = pc.build(name, p, m, chunks=chunks).table
    return t, op_styles(np.asarray(t.column("kind").to_pylist()), t.column("device").to_numpy(),
                        t.column("stage").to_numpy(), t.column("microbatch").to_numpy(), p)


def _lab(colour):
    """CIELAB (D65) of an sRGB #rrggbb colour."""
    c = np.array([int(colour[i:i + 2], 16) / 255.0 for i in (1, 3, 5)])
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ c / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _closest(colours):
    return min(np.linalg.norm(_lab(a) - _lab(b)) for a, b in itertools.combinations(colours, 2))


def test_chimera_has_two_pipelines_and_one_chunk():
    p, m = 8, 32
    t, st = _styles("chimera", p, m)
    mb = t.column("microbatch").to_numpy()
    pipe, entries = pipelines_of(t.column("device").to_numpy(), t.column("stage").to_numpy(), mb)
    assert entries == (0, p - 1)
    assert (pipe[mb < 0] == -1).all()  # the all-reduces serve both
    down = np.unique(mb[(pipe == 0)])
    up = np.unique(mb[(pipe == 1)])
    assert len(down) == len(up) == m // 2 and not set(down) & set(up)
    assert st.n_chunks == 1
    assert not any("chunk" in label for _c, label in st.legend)


def test_bitpipe_chunks_are_the_two_legs_of_each_v():
    p = 8
    t, st = _styles("bitpipe", p, 32, chunks=2)
    stage = t.column("stage").to_numpy()
    has_mb = t.column("microbatch").to_numpy() >= 0
    chunk = np.array([st.chunks[s] for s in st.style])
    assert ((chunk == (stage >= p)) | ~has_mb).all()
    assert st.n_chunks == 2 and len(st.entries) == 2


def test_interleaved_chunks_and_one_pipeline():
    p = 4
    t, st = _styles("interleaved-1f1b", p, 8, chunks=2)
    dev, stage = t.column("device").to_numpy(), t.column("stage").to_numpy()
    assert (chunk_of(dev, stage) == stage // p).all()
    assert st.entries == (0,) and set(st.pipelines) == {0}


@pytest.mark.parametrize("name, chunks", [("bitpipe", 2), ("dualpipe", 1), ("chimera", 1),
                                          ("zb-v", 2), ("interleaved-1f1b", 2), ("hanayo", 2)])
def test_every_colour_of_a_chart_stands_apart(name, chunks):
    # Delta E above 15 is an obvious difference; BitPipe's four purples
    # (kind colour blended 0, 0.15, 0.3 and 0.45 towards white) were 9 apart.
    old = [shade_hex(c, 0.15 * k) for c in ("#4C72B0", "#8172B3") for k in range(4)]
    assert _closest(old) < 10
    _t, st = _styles(name, 8, 32, chunks=chunks)
    assert _closest(st.colours) > 15, st.names


def test_shade_hex_lightens_and_darkens():
    assert shade_hex("#804020", 0.0) == "#804020"
    assert shade_hex("#804020", 1.0) == "#ffffff"
    assert shade_hex("#804020", -1.0) == "#000000"
    assert shade_hex("#804020", -0.5) == "#402010"


def test_a_gantt_png_shows_every_colour_it_names(tmp_path):
    # The PNG is written with a 256-colour palette: every bar colour of the
    # chart (BitPipe's eight: two kinds, two pipelines, two chunks) must
    # survive it, a few units of 255 at most off.
    pytest.importorskip("matplotlib", reason="Gantt charts need pipecore[plot]")
    from PIL import Image

    res = pc.simulate(pc.build("bitpipe", 4, 8, chunks=2), pc.Costs(f=1.0, b=1.0, w=1.0))
    path = res.write_gantt(tmp_path / "b.png")
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.int64).reshape(-1, 3)
    ops = res.ops
    drawn = ops.column("finish").to_numpy() > ops.column("start").to_numpy()
    st = op_styles(np.asarray(ops.column("kind").to_pylist()), ops.column("device").to_numpy(),
                   ops.column("stage").to_numpy(), ops.column("microbatch").to_numpy(), 4,
                   drawn=drawn)
    shown = set(st.style[drawn].tolist())
    assert len(shown) == 8  # the all-reduces take no time here: not drawn
    for s in shown:
        colour, name = st.colours[s], st.names[s]
        want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        near = np.abs(pixels - want).max(axis=1) <= 4
        assert near.sum() > 100, name  # a bar's worth of pixels at least
