"""The nine kernel types of DESIGN.md, by family. Importing a module registers its types."""
