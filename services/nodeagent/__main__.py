from services.common.malloc import reexec_with_jemalloc

if __name__ == "__main__":
    reexec_with_jemalloc()  # before the service's imports: the same command again, on jemalloc

    from services.nodeagent.server import main

    main()
