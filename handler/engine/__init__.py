"""The model and the generation engine.

Every error the engine raises on purpose derives from EngineError (with the builtin kind it always
had, so `except ValueError` callers keep working):

    EngineError
    ├── CheckpointError, ConversionError                 checkpoint.py, convert.py
    ├── PlatformError, KernelBuildError, KernelMismatchError  platform.py, kernels/build.py
    ├── QuantizationError, GGUFFormatError               quant/layout.py, quant/gguf_file.py
    ├── CompileError, AotError (NoMatchingGraph)         compiled/errors.py, compiled/aot.py
    ├── ChatTemplateError, GrammarError                  tokenizer.py, grammar.py
    └── EngineFull                                       engine.py
"""


class EngineError(Exception):
    """The root of the engine's own errors."""
