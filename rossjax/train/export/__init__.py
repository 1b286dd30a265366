"""Export: HF / PEFT / orbax folders of a run, and its tokenizer."""
