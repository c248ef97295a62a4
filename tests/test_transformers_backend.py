"""attn_implementation="fastattn" in Hugging Face transformers: random-init Llama-,
Mistral- (sliding window) and Gemma2-shaped (softcap) models from small configs
(no downloads) give the logits and greedy generations of the built-in backends."""
import pytest

from fa_testutil import rms_rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from fastattn.integrations import transformers as fa_hf  # noqa: E402
from fastattn.integrations import torch as fa_torch  # noqa: E402

fa_hf.register()

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


CONFIGS = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 5}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 16, "sliding_window": 5, "attn_logit_softcapping": 2.0,
                                           "final_logit_softcapping": None, "query_pre_attn_scalar": 16}),
}


def _config(kind, **extra):
    cls, options = CONFIGS[kind]
    return cls(**{**SMALL, **options, **extra})


# the backend fastattn is compared with: sdpa does not take Gemma2's softcap, eager does
BASELINE = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}
_models = {}


def _model(kind, dtype=torch.float32):
    key = (kind, dtype)
    if key not in _models:
        torch.manual_seed(1)
        # a larger init than the default 0.02 so that attention is far from uniform
        # (and softcap, the window and padding all change the logits)
        model = transformers.AutoModelForCausalLM.from_config(_config(kind, initializer_range=0.3))
        _models[key] = model.to(dtype).eval()
    return _models[key]


def _inputs(left_padding):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    if left_padding:
        mask[1, :3] = 0
        mask[2, :6] = 0
        ids[mask == 0] = 0
    return ids, mask


def _logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.double()


@pytest.mark.parametrize("left_padding", [False, True])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_logits_match_builtin_backend(kind, left_padding):
    model = _model(kind)
    ids, mask = _inputs(left_padding)
    want = _logits(model, BASELINE[kind], ids, mask)
    got = _logits(model, "fastattn", ids, mask)
    real = mask.bool()          # padded positions' outputs are not defined alike by all backends
    err = rms_rel_err(got[real].numpy(), want[real].numpy())
    assert err < 1e-5, err
    if left_padding:
        # the padding matters: ignoring it changes the logits far beyond that tolerance
        unpadded = _logits(model, "fastattn", ids, torch.ones_like(mask))
        assert rms_rel_err(unpadded[real].numpy(), want[real].numpy()) > 1e-3


def test_the_options_matter():
    """softcap and the sliding window change the logits far beyond the tolerance
    above, so the comparisons test them."""
    ids, mask = _inputs(False)
    base = _logits(_model("gemma2"), "fastattn", ids, mask)
    no_cap = transformers.AutoModelForCausalLM.from_config(_config("gemma2", attn_logit_softcapping=None))
    no_cap.load_state_dict(_model("gemma2").state_dict())
    assert rms_rel_err(_logits(no_cap.eval(), "eager", ids, mask).numpy(), base.numpy()) > 1e-3
    no_window = transformers.AutoModelForCausalLM.from_config(_config("llama"))
    no_window.load_state_dict(_model("mistral").state_dict())
    assert rms_rel_err(_logits(no_window.eval(), "sdpa", ids, mask).numpy(),
                       _logits(_model("mistral"), "fastattn", ids, mask).numpy()) > 1e-3


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_greedy_generate_gives_identical_tokens(kind, cache):
    model = _model(kind)
    ids, mask = _inputs(True)
    out = {}
    for impl in (BASELINE[kind], "fastattn"):
        model.set_attn_implementation(impl)
        out[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                   cache_implementation=cache, pad_token_id=0)
    assert out["fastattn"].shape == (3, 19)
    assert torch.equal(out["fastattn"], out[BASELINE[kind]])


def _spy(monkeypatch):
    calls = []
    original = fa_torch.attention

    def attention(q, k, v, **options):
        calls.append((tuple(q.shape), tuple(k.shape), options))
        return original(q, k, v, **options)

    monkeypatch.setattr(fa_torch, "attention", attention)
    return calls


def test_masks_become_cheap_options(monkeypatch):
    """What the layers receive: no full (Lq, Lk) mask in prefill or decode, with or
    without padding, dynamic or static cache; grouped heads passed as they are."""
    calls = _spy(monkeypatch)
    model = _model("mistral")
    model.set_attn_implementation("fastattn")
    for cache in ("dynamic", "static"):
        for left_padding in (False, True):
            ids, mask = _inputs(left_padding)
            model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                           cache_implementation=cache, pad_token_id=0)
    assert calls
    for q_shape, k_shape, options in calls:
        assert q_shape[1] == 4 and k_shape[1] == 2           # no repeat_kv
        if "mask" in options:
            assert options["mask"].shape[-2] == 1, (q_shape, k_shape, options)
        if q_shape[2] > 1:                                     # prefill: causal skipping kept
            assert options.get("causal"), options
    prefill = [o for q, k, o in calls if q[2] > 1]
    assert any(o.get("window") == (4, None) for o in prefill)  # Mistral's sliding window (5 keys)


def test_static_cache_prefill_without_mask_is_top_left(monkeypatch):
    """No padding, static cache: transformers passes mask=None with 11 queries and a
    longer cache (unfilled slots after them): top-left causality, as sdpa's is_causal."""
    calls = _spy(monkeypatch)
    model = _model("llama")
    model.set_attn_implementation("fastattn")
    ids, mask = _inputs(False)
    model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, cache_implementation="static",
                   pad_token_id=0)
    q_shape, k_shape, options = calls[0]
    assert q_shape[2] == 11 and k_shape[2] > 11 and options["causal"] == "top_left"


def test_one_decomposition_per_mask(monkeypatch):
    calls = []
    original = fa_hf._mask_decomposition.decompose
    monkeypatch.setattr(fa_hf._mask_decomposition, "decompose", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = _model("llama")
    ids, mask = _inputs(True)
    _logits(model, "fastattn", ids, mask)
    assert len(calls) == 1                         # two layers, one mask tensor
    # a mask changed in place is decomposed again
    m = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    first = fa_hf.mask_options(m, 4, True, None)
    m[0, 0, 3, 0] = False
    second = fa_hf.mask_options(m, 4, True, None)
    assert first == {"causal": True} and set(second) == {"mask"}
    # a full mask is not held by the cache: the next call reads the tensor again
    again = fa_hf.mask_options(m, 4, True, None)
    assert again["mask"].ctypes.data == m.data_ptr() and len(calls) == 3


def test_inference_mode():
    """Inference tensors (no version counter: their masks are not cached) give the same logits."""
    model = _model("mistral")
    ids, mask = _inputs(True)
    want = _logits(model, "sdpa", ids, mask)
    model.set_attn_implementation("fastattn")
    with torch.inference_mode():
        got = model(input_ids=ids, attention_mask=mask).logits.double()
    real = mask.bool()
    assert rms_rel_err(got[real].numpy(), want[real].numpy()) < 1e-5


def test_float16_model_error_is_sdpas():
    ids, mask = _inputs(True)
    real = mask.bool()
    want = _logits(_model("llama"), "sdpa", ids, mask)[real].numpy()
    half = _model("llama", torch.float16)
    err_sdpa = rms_rel_err(_logits(half, "sdpa", ids, mask)[real].numpy(), want)
    err_ours = rms_rel_err(_logits(half, "fastattn", ids, mask)[real].numpy(), want)
    assert err_ours <= 1.5 * err_sdpa + 1e-4, (err_ours, err_sdpa)


def test_bfloat16_model_error_is_sdpas():
    """A bfloat16 model (its caches read as bfloat16, computed in float32, rounded
    once): its logits' error against the float32 model no larger than sdpa's."""
    pytest.importorskip("ml_dtypes")
    ids, mask = _inputs(True)
    real = mask.bool()
    want = _logits(_model("llama"), "sdpa", ids, mask)[real].numpy()
    half = _model("llama", torch.bfloat16)
    err_sdpa = rms_rel_err(_logits(half, "sdpa", ids, mask)[real].numpy(), want)
    err_ours = rms_rel_err(_logits(half, "fastattn", ids, mask)[real].numpy(), want)
    assert err_ours <= 1.05 * err_sdpa + 1e-4, (err_ours, err_sdpa)


def test_errors():
    q = torch.zeros(1, 4, 3, 16)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="dropout"):
        fa_hf.attention_forward(module, q, q, q, None, dropout=0.1)
    out, weights = fa_hf.attention_forward(module, q, q[:, :2], q[:, :2], None)
    assert out.shape == (1, 3, 4, 16) and out.is_contiguous() and weights is None


def test_training_step_gets_gradients():
    """requires_grad tensors take the autograd path (fastattn.attention_backward)."""
    model = transformers.AutoModelForCausalLM.from_config(_config("llama"))
    model.set_attn_implementation("fastattn")
    ids, mask = _inputs(True)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    ref = transformers.AutoModelForCausalLM.from_config(_config("llama"))
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    ref(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    want = ref.model.layers[0].self_attn.q_proj.weight.grad
    assert rms_rel_err(grad.double().numpy(), want.double().numpy()) < 1e-4


def test_docstring_examples():
    import doctest
    result = doctest.testmod(fa_hf)
    assert result.attempted > 0 and result.failed == 0


def test_float_masks_and_position_bias_as_sdpa():
    """A float mask and a position bias (T5-style models) are added to the scores, as sdpa does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 5, 16, generator=g) for _ in range(3))
    module = torch.nn.Module()
    float_mask = torch.randn(2, 1, 5, 5, generator=g)
    bias = torch.randn(1, 4, 5, 5, generator=g)
    bool_mask = torch.rand(2, 1, 5, 5, generator=g) < 0.7
    bool_mask[..., 0] = True
    for mask, position_bias in ((float_mask, None), (None, bias), (float_mask, bias), (bool_mask, bias)):
        want, _ = sdpa_attention_forward(module, q, k, v, mask, position_bias=position_bias, is_causal=False)
        got, _ = fa_hf.attention_forward(module, q, k, v, mask, position_bias=position_bias, is_causal=False)
        assert rms_rel_err(got.numpy(), want.numpy()) < 1e-5


def test_broadcast_batches_and_mixed_dtypes_as_sdpa():
    """Without gradients the result is still attention()'s own shape and dtype: a
    query batch of 1 against 5 cached sequences, a float16 query with float32 keys."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    g = torch.Generator().manual_seed(4)
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 16, generator=g)
    k, v = (torch.randn(5, 2, 3, 16, generator=g) for _ in range(2))
    want, _ = sdpa_attention_forward(module, q, k, v, None, is_causal=False)
    got, _ = fa_hf.attention_forward(module, q, k, v, None, is_causal=False)
    assert got.shape == want.shape == (5, 3, 2, 16)
    assert rms_rel_err(got.numpy(), want.numpy()) < 1e-5
    got, _ = fa_hf.attention_forward(module, q.half(), k[:1], v[:1], None, is_causal=False)
    assert got.dtype == torch.float32      # np.result_type, as fastattn.attention
    want, _ = sdpa_attention_forward(module, q.half().float(), k[:1], v[:1], None, is_causal=False)
    assert rms_rel_err(got.numpy(), want.numpy()) < 1e-5
