"""One module per pass; each exports `PASS`, a `Pass` descriptor (see codegen.pipeline)."""
