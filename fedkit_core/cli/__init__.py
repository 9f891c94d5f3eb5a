"""Entry point of the ``fedkit`` command: runs the Typer app and turns errors into exit codes.

User errors (:class:`FedkitError`) print one message and exit 2; ``--debug`` anywhere on
the command line shows the traceback instead. An interrupted run exits 130 and says how to
resume it. Anything else is a bug: exit 1 with a short message.
"""

from __future__ import annotations

import sys

import click


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    from rich.text import Text

    from fedkit_core.cli.app import app
    from fedkit_core.cli.options import err_console
    from fedkit_core.errors import FedkitError

    command = __import__("typer").main.get_command(app)
    interrupted = "interrupted: continue the run with `fedkit resume RUN_DIR`"
    try:
        code = command.main(args=args, prog_name="fedkit", standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into this return value
            err_console.print(interrupted)
            return 130
        return 0
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as err:
        err.show()
        return 2
    except click.exceptions.Abort:
        err_console.print("aborted")
        return 130
    except FedkitError as err:
        if debug:
            raise
        err_console.print(Text.assemble(("error: ", "bold red"), str(err)), soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        err_console.print(interrupted)
        return 130
    except Exception as err:
        if debug:
            raise
        err_console.print(
            Text.assemble(
                ("internal error: ", "bold red"),
                f"{type(err).__name__}: {err}\n",
                "This is a bug in fedkit or a plugin; rerun with --debug for the traceback.",
            ),
            soft_wrap=True,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
