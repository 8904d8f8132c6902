"""Constants shared by the widget tests (a module of its own: ``conftest`` names clash)."""

XSS_PROMPTS = [
    "<script>window.__kvscope_xss = 1</script> explain the KV cache",
    '<img src=x onerror="window.__kvscope_xss = 2"> what is paged attention?',
]

# JavaScript: Bokeh views of a type in the page, and every canvas including those in shadow roots.
COUNT_VIEWS_JS = """(type) => [...Bokeh.index.all_views()].filter(v => v.model.type == type).length"""
COUNT_CANVASES_JS = """() => {
  let n = 0;
  const walk = (root) => root.querySelectorAll('*').forEach(e => {
    if (e.tagName == 'CANVAS' && e.width > 0 && e.height > 0) n++;
    if (e.shadowRoot) walk(e.shadowRoot);
  });
  walk(document);
  return n;
}"""
