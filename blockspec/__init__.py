"""blockspec: speculative decoding with block-diffusion drafters, verified losslessly."""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutput", "__version__"]


def __getattr__(name):
    # Lazy, so that `import blockspec.sampling` does not load the whole engine.
    if name == "LLM":
        from blockspec.llm import LLM
        return LLM
    if name == "SamplingParams":
        from blockspec.sampling import SamplingParams
        return SamplingParams
    if name == "StructuredOutput":
        from blockspec.structured_output import StructuredOutput
        return StructuredOutput
    raise AttributeError(f"module 'blockspec' has no attribute {name!r}")
