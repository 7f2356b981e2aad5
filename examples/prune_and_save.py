"""Prune the built-in SmolLM2-135M structurally to 80% kept, compare perplexity, save it (README example)."""

import surgeon

model, tokenizer = surgeon.load_model("smollm2-135m")  # a hub id, a local folder, a .gguf file or a built-in name
text = surgeon.calibration_text("wikitext2-valid")
ids, bos = surgeon.tokenize(tokenizer, text), surgeon.leading_token(tokenizer)  # bos: Gemma's, Llama's; SmolLM2 none
calibration_ids = surgeon.calibration_windows(ids, nsamples=2, seqlen=256, seed=0, bos=bos)  # [2, 256]; paper 128×2048
test_ids = surgeon.tokenize(tokenizer, surgeon.evaluation_text("wikitext2"))  # LongTensor [1, T], the whole text
dense = surgeon.perplexity(model, test_ids, seqlen=2048, windows=1)

config = surgeon.PruneConfig(structure="structured", target_size=0.8, shots=1)  # keep 80% of the prunable weights
report = surgeon.prune(model, calibration_ids, config)
pruned = surgeon.perplexity(model, test_ids, seqlen=2048, windows=1)
print(f"perplexity {dense.ppl:.2f} -> {pruned.ppl:.2f}, sparsity {report.sparsity:.3f}")

surgeon.save_model("smollm2-structured80", model, tokenizer, report.to_dict())  # from_pretrained loads this folder
