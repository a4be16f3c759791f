"""Entry point: import every subcommand module so it registers on the app, then run it."""

from __future__ import annotations

import railyard.cli.agent as _agent  # noqa: F401  (registers `agent`)
import railyard.cli.allocate as _allocate  # noqa: F401  (registers `allocate`)
import railyard.cli.cni as _cni  # noqa: F401  (registers `cni serve`, `cni install`)
import railyard.cli.dra as _dra  # noqa: F401  (registers `dra claim-template`, `dra device-classes`)
import railyard.cli.explain as _explain  # noqa: F401  (registers `explain`)
import railyard.cli.scheduler  # noqa: F401  (registers `scheduler`)
import railyard.cli.simulate as _simulate  # noqa: F401  (registers `simulate`)
from railyard.cli import discover  # noqa: F401  (registers `discover`, `fixture`)
from railyard.cli.app import app


def main() -> None:
    app()


if __name__ == "__main__":
    main()
