"""code2wav: the streaming Code2Wav stage of Qwen3-TTS (codec frames -> 24 kHz audio)."""

import os

# CUDA graphs of every step shape share one memory pool. With the allocator's expandable
# segments that pool is about the largest step's activations (H200, bf16: 762 MiB for a
# 480-frame budget); with fixed-size segments the shapes fragment it to about twice that. Read
# when torch first touches CUDA, so it is set on import; a value already in the environment wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
