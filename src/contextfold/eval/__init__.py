"""Retrieval evaluation: test collections, ranking metrics and a runner that reports them."""
