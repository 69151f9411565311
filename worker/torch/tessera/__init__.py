"""Tessera: a distributed training runtime. `import tessera.torch` registers the "tessera"
backend with torch.distributed."""
