"""`python -m sgdeploy ...` is the `sgdeploy` command (pyproject.toml's [project.scripts])."""

from sgdeploy.cli import main

raise SystemExit(main())
