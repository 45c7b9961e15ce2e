"""`python -m hasten ...` is the `hasten` command."""

from hasten.cli.main import main

raise SystemExit(main())
