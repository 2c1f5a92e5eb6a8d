"""`make gpu-check`: every GPU proof in one command, each stage on a budget, one verdict table.

The stages run as child processes (`python -m pytest`, `python -m benchmarks.X`) so that this
package imports only the standard library: a stage that crashes, hangs or runs past its budget
is stopped and reported, and the rest still run. docs/testing.md says how to run it.
"""
