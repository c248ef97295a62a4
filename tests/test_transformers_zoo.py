"""The transformers backend across a zoo of architectures (issue 34).

Tiny random configs (hidden size 64, 2 layers, a small vocabulary; no
downloads) of decoder LMs, encoders, encoder-decoders and a vision model give
the logits (or last hidden states) of transformers' own sdpa backend -- or
eager where a model has no sdpa path (gpt-oss's sinks, Gemma2's softcap) --
on ``attn_implementation="fastattn"``, and decoder LMs the same greedy
generations.  gpt-oss passes its learned attention sinks as ``s_aux``: a test
shows they matter in this config (dropping them would change the logits).
Skipped, with the reason, when torch or transformers is absent.
"""
from __future__ import annotations

import pytest

from fa_testutil import rms_rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from fastattn.integrations import transformers as fa_hf  # noqa: E402

fa_hf.register()

VOCAB = 96
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, initializer_range=0.3)
GQA = dict(BASE, num_key_value_heads=2)

# name: (config class name, options, baseline backend)
DECODERS = {
    "llama": ("LlamaConfig", GQA, "sdpa"),
    "mistral": ("MistralConfig", dict(GQA, sliding_window=5), "sdpa"),
    "mixtral": ("MixtralConfig", dict(GQA, num_local_experts=2, num_experts_per_tok=1), "sdpa"),
    "qwen2": ("Qwen2Config", GQA, "sdpa"),
    "qwen3": ("Qwen3Config", dict(GQA, head_dim=16), "sdpa"),
    "gemma": ("GemmaConfig", dict(GQA, head_dim=16), "sdpa"),
    "gemma2": ("Gemma2Config", dict(GQA, head_dim=16, sliding_window=5, attn_logit_softcapping=2.0,
                                    final_logit_softcapping=None, query_pre_attn_scalar=16), "eager"),
    "phi3": ("Phi3Config", dict(GQA, pad_token_id=0), "sdpa"),
    "olmo2": ("Olmo2Config", GQA, "sdpa"),
    "gpt_oss": ("GptOssConfig", dict(GQA, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                                     sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
                "eager"),
}
_models = {}


def _config(cls_name, options):
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    return cls(**options)


def _decoder(name):
    if name not in _models:
        cls_name, options, _ = DECODERS[name]
        torch.manual_seed(1)
        model = transformers.AutoModelForCausalLM.from_config(_config(cls_name, options))
        if name == "gpt_oss":
            with torch.no_grad():       # large sinks, so that they take a real share of each row
                for layer in model.model.layers:
                    layer.self_attn.sinks.normal_(0.0, 2.0)
        _models[name] = model.eval()
    return _models[name]


def _ids(batch=2, length=9, seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :3] = 0          # left padding in the second row
    return ids, mask


def _run(model, impl, **inputs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(**inputs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).double()


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoder_logits_and_greedy_generation(name):
    model = _decoder(name)
    baseline = DECODERS[name][2]
    ids, mask = _ids()
    want = _run(model, baseline, input_ids=ids, attention_mask=mask)
    got = _run(model, "fastattn", input_ids=ids, attention_mask=mask)
    real = mask.bool()
    err = rms_rel_err(got[real].numpy(), want[real].numpy())
    assert err < 1e-5, (name, err)
    gen = {}
    for impl in (baseline, "fastattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            gen[impl] = model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=6,
                                       do_sample=False, pad_token_id=0)
    assert torch.equal(gen[baseline], gen["fastattn"]), name


def test_gpt_oss_sinks_matter():
    """Dropping s_aux (the sinks) would change gpt-oss's logits far beyond the
    tolerance above: the sinks are exercised, not just passed along."""
    model = _decoder("gpt_oss")
    ids, mask = _ids()
    want = _run(model, "eager", input_ids=ids, attention_mask=mask)

    def no_sinks(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("s_aux")
        return fa_hf.attention_forward(module, query, key, value, attention_mask, **kwargs)

    transformers.AttentionInterface.register("fastattn_no_sinks", no_sinks)
    transformers.AttentionMaskInterface.register("fastattn_no_sinks", transformers.masking_utils.sdpa_mask)
    dropped = _run(model, "fastattn_no_sinks", input_ids=ids, attention_mask=mask)
    real = mask.bool()
    assert rms_rel_err(dropped[real].numpy(), want[real].numpy()) > 1e-2


def test_unknown_keyword_raises():
    """A keyword the backend does not handle is never dropped silently; the
    documented ones that do not change the math are accepted."""
    q = torch.randn(1, 4, 3, 8)
    kv = torch.randn(1, 2, 3, 8)
    layer = type("Layer", (), {"is_causal": True})()
    with pytest.raises(NotImplementedError, match="head_mask"):
        fa_hf.attention_forward(layer, q, kv, kv, None, head_mask=torch.ones(4))
    out, _ = fa_hf.attention_forward(layer, q, kv, kv, None, position_ids=torch.arange(3)[None],
                                     cache_position=torch.arange(3), output_attentions=False, head_mask=None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2))
    assert {"position_ids", "cache_position"} <= fa_hf.IGNORED_KEYWORDS


# encoders, encoder-decoders and a vision model: (config class, options, model class, inputs)
def _text_inputs():
    ids, mask = _ids(length=10)
    return dict(input_ids=ids, attention_mask=mask)


def _seq2seq_inputs():
    ids, mask = _ids(length=10)
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=_ids(length=6, seed=3)[0])


OTHERS = {
    "bert": ("BertConfig", dict(BASE, num_hidden_layers=2), "BertModel", _text_inputs),
    "modernbert": ("ModernBertConfig", dict(BASE, global_attn_every_n_layers=2, local_attention=4,
                                            pad_token_id=0), "ModernBertModel", _text_inputs),
    "bart": ("BartConfig", dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
                                decoder_ffn_dim=96, max_position_embeddings=64, init_std=0.3),
             "BartModel", _seq2seq_inputs),
    "t5": ("T5Config", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                            initializer_factor=1.5), "T5Model", _seq2seq_inputs),
    "vit": ("ViTConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                              image_size=32, patch_size=8, initializer_range=0.3), "ViTModel",
            lambda: dict(pixel_values=torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)))),
}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_encoder_and_seq2seq_outputs(name):
    cls_name, options, model_name, make_inputs = OTHERS[name]
    config = _config(cls_name, options)
    torch.manual_seed(1)
    model = getattr(transformers, model_name)(config).eval()
    inputs = make_inputs()
    want = _run(model, "sdpa", **inputs)
    got = _run(model, "fastattn", **inputs)
    if "attention_mask" in inputs and "decoder_input_ids" not in inputs:
        real = inputs["attention_mask"].bool()
        got, want = got[real], want[real]
    err = rms_rel_err(got.numpy(), want.numpy())
    assert err < 1e-5, (name, err)
