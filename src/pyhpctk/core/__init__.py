"""The data model shared by the tools: calling context trees (:mod:`.context`) and metric
scopes, partials and ids (:mod:`.metrics`). Data and tree arithmetic only, no file I/O."""
