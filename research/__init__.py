"""One-off studies behind figures in docs/ (research/README.md indexes them); not run by CI."""
