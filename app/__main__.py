"""python -m app → the oarlock CLI."""

from app.cli import main

main()
