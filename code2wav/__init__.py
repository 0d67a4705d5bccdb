"""code2wav: the streaming Code2Wav stage of Qwen3-TTS (codec frames -> 24 kHz audio)."""
