"""Pure views of decoding results: token frames, HTML and plotly figures (no torch)."""
