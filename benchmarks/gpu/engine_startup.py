"""Cold and warm starts of the fast engine on a GPU (issue 51, start-up): one process per start,
the second finding Inductor's on-disk cache the first filled. Prints seconds per start: imports,
engine build (model to the GPU), first call (compile + graph capture + 256 rows x 48 tokens),
second call. SmolLM2-135M's shapes with random weights, built from the tokenizer in .gpu/tokenizer
(benchmarks/gpu/engine.sh says how to stage it); on a lent machine, after installing reflexdb as
engine.sh does: python3 benchmarks/gpu/engine_startup.py"""
import json, os, subprocess, sys, time
if sys.argv[1:] == ["run"]:
    t0 = time.perf_counter()
    import torch
    from reflexdb.collector.engines.fast import FastEngine
    from reflexdb.collector.engines.base import SamplingParams
    t1 = time.perf_counter()
    e = FastEngine("/tmp/warm-model", device="cuda", max_batch_size=256)
    torch.cuda.synchronize(); t2 = time.perf_counter()
    prompts = [[{"role": "user", "content": f"What is {3 + i % 7} + {i % 5 + 1}?"}] for i in range(32)]
    p = SamplingParams(temperature=1.0, max_new_tokens=48, seed=1)
    e.generate(prompts, n=8, params=p); torch.cuda.synchronize(); t3 = time.perf_counter()
    e.generate(prompts, n=8, params=p); torch.cuda.synchronize(); t4 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "first_call_s": t3 - t2, "second_call_s": t4 - t3}), flush=True)
    sys.exit(0)
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok = AutoTokenizer.from_pretrained(".gpu/tokenizer")
cfg = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                  hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained("/tmp/warm-model"); tok.save_pretrained("/tmp/warm-model")
for label in ("cold", "warm"):
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "run"], capture_output=True, text=True)
    print(label, out.stdout.strip() or out.stderr[-1500:], "process %.1f s" % (time.perf_counter() - t), flush=True)
