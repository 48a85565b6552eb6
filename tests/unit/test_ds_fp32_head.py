"""``fp32_lm_head`` (issue 34 item 4): a bfloat16 model's logits computed in float32 from its
own weights, with the gradient still reaching the (bfloat16) head weight; float32 models
untouched. The whole-engine effect on the mismatch is in ``bench/mismatch.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arctic_platform.rl.api import EngineConfigError  # noqa: E402
from arctic_platform.rl.testing import build_tiny_model  # noqa: E402
from arctic_rl_engines.ds_config import forward_setup  # noqa: E402
from arctic_rl_engines.ds_model import fp32_output_head, load_causal_lm  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("fp32head") / "m", hidden_size=64))


def _hidden_and_logits(model, ids):
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


def test_bf16_logits_in_float32_equal_a_float32_product_of_the_bf16_operands(model_dir):
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = load_causal_lm(model_dir, dtype="bfloat16", attn_impl=None)
    wide = load_causal_lm(model_dir, dtype="bfloat16", attn_impl=None, fp32_lm_head=True)
    hidden, logits = _hidden_and_logits(wide, ids)
    assert logits.dtype == torch.float32
    head = wide.get_output_embeddings().weight
    assert head.dtype == torch.bfloat16  # the weight itself is unchanged
    expected = hidden.float() @ head.float().T
    assert torch.allclose(logits, expected, atol=1e-5, rtol=1e-5)
    _, rounded = _hidden_and_logits(plain, ids)
    assert rounded.dtype == torch.bfloat16
    # bf16 logits are rounded to 8 significant bits; the float32 ones are not
    gap = (rounded.float() - logits).abs().max().item()
    assert gap > 1e-4, gap


def test_the_head_weight_gets_its_gradient_through_the_cast(model_dir):
    model = load_causal_lm(model_dir, dtype="bfloat16", attn_impl=None, fp32_lm_head=True)
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=ids, use_cache=False).logits
    torch.log_softmax(logits, dim=-1)[..., 3].sum().backward()
    grad = model.get_output_embeddings().weight.grad
    assert grad is not None and grad.dtype == torch.bfloat16 and grad.abs().sum() > 0


def test_a_float32_model_is_left_as_it_is(model_dir):
    model = load_causal_lm(model_dir, dtype="float32", attn_impl=None)
    assert fp32_output_head(model) is False
    assert "forward" not in vars(model.get_output_embeddings())


def test_the_log_prob_engine_takes_fp32_lm_head_as_its_own_key():
    assert forward_setup({"fp32_lm_head": True}, on_cpu=True).fp32_lm_head is True
    assert forward_setup({}, on_cpu=True).fp32_lm_head is False
    with pytest.raises(EngineConfigError, match="fp32_lm_head"):
        forward_setup({"fp32_lm_head": "yes"}, on_cpu=True)
