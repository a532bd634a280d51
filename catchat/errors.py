"""One exception type for every failure a user can fix: the CLI prints it as one or two lines."""


class CatchatError(Exception):
    """A failure with a message for the user, a fix hint and a process exit code.

    `exit_code` follows the CLI's convention: 1 for a failed check or run, 2 for bad input or a
    missing prerequisite (config, flag, file, Vulkan device).
    """

    exit_code = 1
    label = "error"  # the word the command line prints before the message

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class UsageError(CatchatError):
    """Bad input: an unknown config key, a wrong value, an unreadable file."""

    exit_code = 2


class VulkanUnavailable(CatchatError):
    """No Vulkan loader, no device, or the chosen device does not exist."""

    exit_code = 2


class ShaderCompileError(CatchatError):
    """glslc rejected a shader: names the file, the line and the compiler's message."""

    exit_code = 1


class DeviceLost(CatchatError):
    """The Vulkan device failed while running recorded work (VK_ERROR_DEVICE_LOST and the like):
    nothing on it can be trusted or read back; the message says what was running."""

    exit_code = 1


class CheckpointWriteError(CatchatError):
    """A checkpoint could not be written (disk full, quota, permissions): the previous one is intact."""

    exit_code = 1
