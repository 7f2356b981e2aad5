"""Prune the built-in SmolLM2-135M structurally to 80% kept, compare perplexity, save it (README example)."""

from surgeon import (
                     PruneConfig,
                     calibration_text,
                     calibration_windows,
                     evaluation_text,
                     load_model,
                     perplexity,
                     prune,
                     save_model,
                     tokenize,
)

model, tokenizer = load_model("smollm2-135m")  # a hub id, a local folder, a .gguf file or a built-in name
calibration_ids = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")),
                                      nsamples=2, seqlen=256, seed=0)  # LongTensor [2, 256]; the paper: 128 × 2048
test_ids = tokenize(tokenizer, evaluation_text("wikitext2"))  # LongTensor [1, T], the whole test text
dense = perplexity(model, test_ids, seqlen=2048, windows=1)

config = PruneConfig(structure="structured", target_size=0.8, shots=1)  # keep 80% of the prunable weights
report = prune(model, calibration_ids, config)
pruned = perplexity(model, test_ids, seqlen=2048, windows=1)
print(f"perplexity {dense.ppl:.2f} -> {pruned.ppl:.2f}, sparsity {report.sparsity:.3f}")

save_model("smollm2-structured80", model, tokenizer, report.to_dict())  # from_pretrained loads this folder
