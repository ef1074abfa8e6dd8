"""An annotated, working spec for every job kind: ``burn-remote jobs template KIND`` prints
one, docs/jobs.md shows the same text, and a test submits each as printed (with the files it
names made small) and runs it to the end. Kept as text, comments included, because the
comments are the documentation a user edits next to."""

from __future__ import annotations

LORA_FINETUNE = """\
# A LoRA fine-tune of a GPT-2 checkpoint: burn-remote jobs submit lora.toml --peer SERVER
# Local paths are relative to this file and uploaded; "sha256:<hex>", "server:<path>" and
# "job:<id>" name inputs already on the server.
kind = "lora_finetune"
name = "gpt2-lora"          # shown by `jobs list`
seed = 0                    # same seed, same spec, same data: the same adapter, byte for byte
steps = 200                 # or epochs = 3 (passes over the data; steps computed at submit)
batch_size = 8              # windows of context + 1 tokens per step (at most the data holds)
checkpoint_every = 50       # a restarted server resumes from the last checkpoint

[model]
weights = "gpt2"            # a GPT-2 save_pretrained directory (config.json +
                            # model.safetensors), or one .safetensors file with n_head = ...
dropout = 0.0

[data]
path = "tokens.npz"         # an npz with int64 "tokens" (ids from the model's tokenizer), or
                            # a text file: its bytes are the ids (or give alphabet = "...")

[lora]                      # PEFT's LoraConfig: r, alpha (lora_alpha), dropout (lora_dropout)
r = 8
alpha = 16
dropout = 0.05
target_modules = ["c_attn", "c_proj"]  # each must name a layer of the model (checked at
                                       # submit); a single string is a regex, or "all-linear"

[optimizer]
name = "adamw"              # adamw, adam or sgd
lr = 1e-3                   # (learning_rate)
weight_decay = 0.0

[schedule]
kind = "cosine"             # constant, cosine or linear_warmup
warmup_steps = 20
"""

TRAIN = """\
# Train a model from scratch on the server: burn-remote jobs submit train.toml --peer SERVER
kind = "train"
name = "mlp"
seed = 0
steps = 300                 # or epochs = 10
batch_size = 64             # rows of x per step (at most the data holds)
checkpoint_every = 100
clip = 1.0                  # gradient norm clipping (max_grad_norm); remove for none

[model]
arch = "sequential"         # or "gpt" with a [model.config] table (n_layer, n_head, d_model,
                            # vocab, context) and token data as for lora_finetune
layers = [                  # linear, relu, gelu, conv2d, maxpool2d, flatten, layernorm, dropout
    { type = "linear", in_features = 64, out_features = 128 },
    { type = "relu" },
    { type = "linear", in_features = 128, out_features = 10 },
]

[data]
path = "data.npz"           # an npz with float "x" (rows x features) and "y": integer class
                            # ids (cross-entropy) or floats (mean squared error)

[optimizer]
name = "adamw"
lr = 3e-3
"""

ONNX_EXPORT = """\
# Export a model to ONNX on the server: burn-remote jobs submit export.toml --peer SERVER
kind = "onnx_export"
name = "gpt2-onnx"
example_shape = [1, 16]     # the example traced: [batch, sequence] token ids for a GPT
dynamic_axes = { "0" = "batch", "1" = "sequence" }  # axes that may change at run time

[model]
weights = "gpt2"            # as in lora_finetune; or "job:<id>" (a train job's model)
# adapter = "job:<id>"      # merge a lora_finetune job's adapter before exporting
"""

TEMPLATES = {"lora_finetune": LORA_FINETUNE, "train": TRAIN, "onnx_export": ONNX_EXPORT}
"""Kind -> the annotated spec `jobs template KIND` prints (every kind has one)."""

__all__ = ["TEMPLATES"]
