"""Entry point of the ``fedkit`` command: runs the Typer app and turns errors into exit codes.

User errors (:class:`FedkitError`) print one message and exit 2; ``--debug`` anywhere on
the command line shows the traceback instead. A mistyped command, option or value prints
click's usage message (the option named, with "did you mean") and exits 2. An interrupted
run exits 130 and says how to resume it. An operating system error (a read-only folder, a full
disk) is the machine's, not a bug: its message and exit 2. Anything else is a bug: exit 1
with a short message.
"""

from __future__ import annotations

import os
import sys

import click
import typer

try:  # typer >= 0.26 ships its own copy of click, whose exceptions are not click's
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:  # older typer raises click's own exceptions
    _TyperClickException = click.ClickException

#: Usage errors (unknown command or option, bad or missing value) of either click.
USAGE_ERRORS = (click.ClickException, _TyperClickException)
#: Ctrl-C at a prompt, or an explicit abort, of either click.
ABORTS = (click.exceptions.Abort, typer.Abort)


def main(argv: list[str] | None = None) -> int:
    """Run ``fedkit`` with ``argv`` (default: the command line) and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    if debug:  # engines keep third-party tracebacks of tolerated failures unless this is set
        os.environ["FEDKIT_DEBUG"] = "1"
    from rich.text import Text

    from fedkit_core.cli.app import app
    from fedkit_core.cli.options import err_console, resume_hint
    from fedkit_core.errors import FedkitError

    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="fedkit", standalone_mode=False)
    except USAGE_ERRORS as err:
        if "Did you mean" in err.message:  # typer < 0.26 added it, click >= 8.2 would again
            err.possibilities = None
        err.show()
        return 2
    except ABORTS:
        err_console.print("aborted")
        return 130
    except FedkitError as err:
        if debug:
            raise
        err_console.print(Text.assemble(("error: ", "bold red"), str(err)), soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        err_console.print(f"interrupted: {resume_hint[0]}", soft_wrap=True)
        return 130
    except OSError as err:  # read-only folder, full disk, missing permission: not a bug
        if debug:
            raise
        where = f": {err.filename}" if err.filename else ""
        err_console.print(
            Text.assemble(("error: ", "bold red"), f"{err.strerror or err}{where}"),
            soft_wrap=True,
        )
        return 2
    except Exception as err:
        if debug:
            raise
        from fedkit_core.errors import failure_text

        err_console.print(
            Text.assemble(
                ("internal error: ", "bold red"),
                f"{failure_text(err)}\n",
                "This is a bug in fedkit or a plugin; rerun with --debug for the traceback.",
            ),
            soft_wrap=True,
        )
        return 1
    # without standalone mode, click returns the code of an explicit exit (--help: 0;
    # Ctrl-C during a run: typer's 130) and a command's return value (None) otherwise
    if code == 130:
        err_console.print(f"interrupted: {resume_hint[0]}", soft_wrap=True)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
