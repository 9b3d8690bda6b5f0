"""python -m kvsim"""

from kvsim.cli import main

main()
