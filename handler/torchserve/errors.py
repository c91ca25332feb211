"""What goes wrong when driving TorchServe."""


class TorchServeError(RuntimeError):
    """TorchServe did not do what was asked: it did not start, stop or answer its management API."""


class TorchServeAuthError(TorchServeError):
    """The management key was refused even after a refresh, or there is no key file to read."""
