// process_logits (docs/semantics.md 5.12): not yet on this backend (capabilities: processing = false).
