"""What a run leaves behind: the conformance report (report, and pytest_plugin which collects it through
xdist), reproducers of failing cases (repro) and the nightly CI matrix (matrix). The top room: nothing in
harness/ imports from here but the CLI and conftest."""
