def register(main): pass
