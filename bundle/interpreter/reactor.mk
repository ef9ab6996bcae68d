# Links python.wasm as a WASI reactor around sandcell.c (see there), with the objects,
# libraries and flags CPython's own Makefile links its command module with. Used as
# `make -f Makefile -f reactor.mk SANDCELL_C=... python-reactor.wasm` in the host build
# directory; __stack_pointer is exported so that a snapshot can read it.
Programs/sandcell.o: $(SANDCELL_C)
	$(CC) -c $(PY_CORE_CFLAGS) -o $@ $(SANDCELL_C)

python-reactor.wasm: Programs/sandcell.o $(LINK_PYTHON_DEPS)
	$(LINKCC) $(PY_CORE_LDFLAGS) $(LINKFORSHARED) -mexec-model=reactor -Wl,--export=__stack_pointer \
	  -o $@ Programs/sandcell.o $(LINK_PYTHON_OBJS) $(LIBS) $(MODLIBS) $(SYSLIBS)
