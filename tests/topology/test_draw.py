"""PNG drawings of topologies (matplotlib Agg canvas + networkx)."""

import pytest

from dpdl.errors import DPDLError
from dpdl.topology import make_topology
from dpdl.topology.draw import draw_topology

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("name", "n"), [("exp", 12), ("torus", 12), ("star", 6), ("erdos-renyi", 10)]
)
def test_drawing_writes_a_png(tmp_path, name, n):
    path = draw_topology(
        make_topology(name, n, probability=0.4 if name == "erdos-renyi" else None),
        tmp_path / "sub" / f"{name}.png",
    )
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_time_varying_drawing_has_small_multiples(tmp_path):
    """exp n=12 (period 4): 4 step panels + the union -> a taller figure than a static graph."""
    from matplotlib.image import imread

    tall = imread(draw_topology(make_topology("exp", 12), tmp_path / "exp.png"))
    single = imread(draw_topology(make_topology("ring", 12), tmp_path / "ring.png"))
    assert tall.shape[0] > single.shape[0] and tall.shape[1] > single.shape[1]


def test_drawing_needs_png_suffix(tmp_path):
    with pytest.raises(DPDLError, match="PNG"):
        draw_topology(make_topology("ring", 4), tmp_path / "ring.jpg")
