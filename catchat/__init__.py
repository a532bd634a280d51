"""catchat: character-level GRU language models trained on Vulkan compute through Kompute."""

__version__ = "0.1.0"
