"""HTTP routes: thin handlers (parse -> validate -> backend -> schema)."""
