"""The request layer: each endpoint's operation (parse, engine job, render), its routes, body schemas and inputs,
the limits and the text work (tokenizer, prompts, templates) they use."""
