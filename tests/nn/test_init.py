"""Initial weights keyed by name (studylib.nn.init): a control's model holds its reference's
initial values in every tensor they share, as the trainer builds them."""
from pathlib import Path

import pytest
import torch

from studylib.config import load_preset
from studylib.nn.init import Draw
from studylib.nn.model import Decoder
from studylib.run.dist import seed_everything

ROOT = Path(__file__).resolve().parents[2]


def _initial(preset, model: str, seed: int) -> dict:
    seed_everything(seed)  # as the trainer does before it builds the model
    return dict(Decoder(preset.model_config(model)).named_parameters())


@pytest.mark.parametrize("reference, controls", [
    ("moe_top2_z", ["moe_hash", "moe_frozen"]), ("moe_s", ["moe_s_hash", "moe_s_frozen"])])
def test_a_router_control_starts_from_the_reference_but_for_its_router(reference, controls):
    preset = load_preset(ROOT / "params" / "cpu.yaml")
    ref = _initial(preset, reference, 1338)
    for name in controls:
        c = _initial(preset, name, 1338)
        shared = ref.keys() & c.keys()
        assert ref.keys() - shared <= {f"blocks.{i}.ffn.router.weight" for i in range(4)}, name
        assert all(torch.equal(ref[k], c[k]) for k in shared), name
    assert not torch.equal(ref["tok_emb.weight"], _initial(preset, reference, 1339)["tok_emb.weight"])


@pytest.mark.parametrize("moe, dense", [("moe_one", "dense_one"), ("moe_s_one", "dense_s_one")])
def test_the_one_expert_moe_starts_as_its_dense_twin(moe, dense):
    """Every tensor but the router: the attention, embeddings and norms by name, the FFN's one
    expert as the twin's dense FFN (gate|up and down)."""
    preset = load_preset(ROOT / "params" / "cpu.yaml")
    m, d = _initial(preset, moe, 1337), _initial(preset, dense, 1337)
    for i in range(4):
        assert torch.equal(m.pop(f"blocks.{i}.ffn.w_in_EFD")[0], d.pop(f"blocks.{i}.ffn.w_in.weight"))
        assert torch.equal(m.pop(f"blocks.{i}.ffn.w_out_EDH")[0], d.pop(f"blocks.{i}.ffn.w_out.weight"))
        m.pop(f"blocks.{i}.ffn.router.weight")
    assert m.keys() == d.keys() and all(torch.equal(m[k], d[k]) for k in m)


def test_a_draw_depends_on_the_key_and_the_name_only():
    a, b = torch.empty(3, 4), torch.empty(12)
    Draw(7).normal_(a, 1.0, "x.w")
    (Draw(7) / "x").normal_(b, 1.0, "w")  # the same name, another shape and a prefix: the same stream
    assert torch.equal(a.flatten(), b)
    for other in (Draw(8), Draw(7) / "y"):
        c = torch.empty(3, 4)
        other.normal_(c, 1.0, "w" if other.prefix else "x.w")
        assert not torch.equal(a, c)
    Draw(7).normal_(c := torch.empty(3, 4), 2.0, "x.w")
    assert torch.allclose(c, 2 * a)
