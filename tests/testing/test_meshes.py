"""simulated_mesh: host CPU meshes, and what it says when jax has too few devices."""

from __future__ import annotations

import pytest

from safedma.testing import NotEnoughDevicesError, simulated_mesh


def test_simulated_mesh_shapes() -> None:
    assert simulated_mesh(8, "x").devices.shape == (8,)
    mesh = simulated_mesh((2, 4), ("x", "y"))
    assert mesh.devices.shape == (2, 4)
    assert tuple(mesh.axis_names) == ("x", "y")
    assert all(d.platform == "cpu" for d in mesh.devices.flat)


def test_simulated_mesh_with_too_few_devices_says_how_to_get_more() -> None:
    with pytest.raises(
        NotEnoughDevicesError, match=r"XLA_FLAGS=--xla_force_host_platform_device_count=16.*before"
    ):
        simulated_mesh((4, 4), ("x", "y"))


def test_simulated_mesh_rejects_mismatched_names() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        simulated_mesh((2, 4), ("x",))


@pytest.mark.parametrize(("shape", "names"), [((0,), ("x",)), ((2, 2), ("x", "x"))])
def test_simulated_mesh_rejects_bad_shapes_and_repeated_names(
    shape: tuple[int, ...],
    names: tuple[str, ...],
) -> None:
    with pytest.raises(ValueError, match="positive integers|distinct"):
        simulated_mesh(shape, names)
