// Turn the book's ```mermaid blocks (the workflows drawn by `sasctl validate --graph`) into
// diagrams: MkDocs renders them as <pre><code class="language-mermaid">; mermaid.js wants
// <pre class="mermaid">. Without the network the blocks stay as their text.
document.addEventListener("DOMContentLoaded", async () => {
  const blocks = document.querySelectorAll("pre > code.language-mermaid");
  if (blocks.length === 0) return;
  for (const code of blocks) {
    const pre = code.parentElement;
    pre.classList.add("mermaid");
    pre.textContent = code.textContent;
  }
  try {
    const { default: mermaid } = await import("https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs");
    mermaid.initialize({ startOnLoad: false, securityLevel: "strict" });
    await mermaid.run({ querySelector: "pre.mermaid" });
  } catch (e) {
    console.warn("mermaid.js not loaded; the diagrams stay as text", e);
  }
});
