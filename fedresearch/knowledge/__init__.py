"""Knowledge bases: the federation served to other platforms (Dify's External Knowledge API)."""
