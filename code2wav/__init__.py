"""code2wav: the streaming Code2Wav stage of Qwen3-TTS (codec frames -> 24 kHz audio)."""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)
