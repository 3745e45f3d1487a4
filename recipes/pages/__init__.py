"""The one generator of every generated page: ``python -m recipes.pages`` rewrites the whole pages
(docs/architectures.md, codecs.md, choosing-a-split.md, latency-model.md), every ``<!-- table:NAME -->`` block
of README.md, docs/*.md and bench/README.md, and the plots of results/, from results/*.json only.

One small module per page or family of tables; every table goes through :func:`md.md_table`."""
