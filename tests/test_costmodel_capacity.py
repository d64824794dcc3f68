"""KV capacity from model and GPU specs (seed 004 Sec. 7), with and without GQA."""

import dataclasses

import pytest

from kvsched.cli import main
from kvsched.costmodel.capacity import kv_capacity
from kvsched.costmodel.presets import get_gpu, get_model, model_from_dims
from kvsched.errors import InputError


def test_seed_004_example_llama_2_70b_on_two_a100():
    r = kv_capacity(get_model("llama-2-70b"), get_gpu("a100-80gb"), tp=2)
    assert r.kv_bytes_paper == 2 * 80 * 8192 * 2 == 2_621_440
    assert r.kv_bytes_gqa == 2 * 80 * 8 * 128 * 2 == 327_680 == r.kv_bytes_paper // 8
    assert r.memory_bytes == 160e9 and r.weight_bytes == 140e9
    # The paper's own formula gives 20e9 / 2,621,440 = 7,629.39 tokens, not the 16,492 it states.
    assert r.tokens_paper == 7_629
    assert r.stated == 16_492
    assert r.tokens_gqa == 61_035 == int(20e9 // 327_680)


def test_mha_models_agree_and_gqa_models_differ_by_the_head_ratio():
    r = kv_capacity(get_model("llama-2-7b"), get_gpu("a100-80gb"))
    assert r.tokens_paper == r.tokens_gqa == int((80e9 - 14e9) // 524_288) == 125_885
    m = kv_capacity(get_model("mistral-7b"), get_gpu("h100"))
    assert m.kv_bytes_paper == 4 * m.kv_bytes_gqa  # 32 query heads, 8 KV heads


def test_weights_that_do_not_fit_are_a_clear_error():
    with pytest.raises(InputError, match="do not fit in 1 x a100-80gb"):
        kv_capacity(get_model("llama-2-70b"), get_gpu("a100-80gb"), tp=1)


def test_presets_and_aliases():
    assert get_model("Llama-2-7b-hf").name == "llama-2-7b"
    assert get_gpu("a100").name == "a100-80gb"
    assert get_gpu("H200").memory_gb == 141
    # Vidur pads Llama-2's vocabulary to 32768; Llama-3-8B and Mistral-7B differ only in vocabulary.
    assert model_from_dims(32, 32, 4096, 11008, 32768).name == "llama-2-7b"
    assert model_from_dims(32, 8, 4096, 14336, 128256).name == "llama-3-8b"
    assert model_from_dims(32, 8, 4096, 14336, 32000).name == "mistral-7b"
    assert model_from_dims(1, 1, 1, 1, 1) is None
    with pytest.raises(InputError, match="unknown model 'gpt-9'"):
        get_model("gpt-9")


def test_capacity_command(capsys):
    assert main(["capacity", "--model", "llama-2-70b", "--gpu", "a100-80gb", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "7,629" in out and "61,035" in out and "16,492" in out and "GQA" in out
    assert out.strip().splitlines()[-1] == "M = 61035 tokens"


def test_capacity_command_bad_input(capsys):
    assert main(["capacity", "--model", "llama-2-7b", "--gpu", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown gpu 'tpu'" in err


def test_kv_heads_are_replicated_where_tp_exceeds_them():
    # Llama-2-70B has 8 KV heads: on 16 GPUs each holds one, so every head is stored twice (vLLM's
    # max(1, kv_heads // tp)); M is what the memory holds of such tokens, not twice as many.
    model, gpu = get_model("llama-2-70b"), get_gpu("h100-80gb")
    eight, sixteen = kv_capacity(model, gpu, tp=8), kv_capacity(model, gpu, tp=16)
    assert sixteen.kv_bytes_gqa == 2 * eight.kv_bytes_gqa == 2 * model.kv_bytes_per_token
    assert sixteen.tokens_gqa == int(sixteen.free_bytes // (2 * model.kv_bytes_per_token))
    assert kv_capacity(model, gpu, tp=64).kv_bytes_gqa == 8 * model.kv_bytes_per_token
    # A model whose KV heads tp neither divides nor multiplies has no even split: refused.
    odd = dataclasses.replace(model, name="odd", kv_heads=6)
    with pytest.raises(InputError, match=r"--tp: odd's 6 KV heads cannot be split evenly over 4 GPUs"):
        kv_capacity(odd, gpu, tp=4)
