"""The island's training: model, data, inner loop, evaluation, baseline (no networking; see `node`)."""
